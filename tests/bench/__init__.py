"""Tests of jaxrl_llm.bench."""
