"""Ways into the trainers people use: Hugging Face Trainer and Accelerate, Lightning Fabric.

Each integration is imported on its own (``from perfora.integrations import fabric``,
``accelerate`` or ``transformers``), so ``import perfora`` never imports those packages.
"""
