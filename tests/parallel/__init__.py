"""Tests of jaxrl_llm.parallel."""
