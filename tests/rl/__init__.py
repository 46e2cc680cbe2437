"""Tests of jaxrl_llm.rl."""
