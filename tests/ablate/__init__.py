"""Tests of jaxrl_llm.ablate."""
