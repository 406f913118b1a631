"""Model recipes: the models ``precompile warmup`` and the tools compile (:mod:`.catalog` lists them).

Owns shape lists and recipe settings (:mod:`.base`), the random-weight ``transformers`` LMs (:mod:`.lm`) and
all-MiniLM-L6-v2 with its real weights (:mod:`.minilm`).  Nothing in the core imports a recipe.

May import: :mod:`precompile.errors` (and torch, transformers) only (docs/architecture.md).
"""
