"""Prefix caching, chapter 3 of part 5: SGLang's radix tree, the chat, few-shot and agent workloads, and their figures (see :mod:`utils.serving`)."""
