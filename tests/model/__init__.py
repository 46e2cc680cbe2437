"""Tests of jaxrl_llm.model."""
