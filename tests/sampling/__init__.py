"""Tests of jaxrl_llm.sampling."""
