"""Tests of jaxrl_llm.rewards."""
