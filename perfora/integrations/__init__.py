"""Ways into the trainers people use: Lightning Fabric and Hugging Face Accelerate.

Each integration is imported on its own (``from perfora.integrations import fabric``), so
``import perfora`` never imports those packages.
"""
