"""Part 7's shared code: the capstones, which put the book's parts together (a 4D training step, GRPO with the
book's own serving engine)."""
