"""Tests of jaxrl_llm.data."""
