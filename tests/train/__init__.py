"""Tests of jaxrl_llm.train."""
