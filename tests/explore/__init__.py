"""Tests of jaxrl_llm.explore."""
