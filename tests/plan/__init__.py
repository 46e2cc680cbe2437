"""Tests of jaxrl_llm.plan."""
