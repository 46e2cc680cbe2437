"""Tests of jaxrl_llm.cli."""
