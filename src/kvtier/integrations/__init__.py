"""Adapters that put kvtier inside other serving engines (``kvtier.integrations.vllm``)."""
