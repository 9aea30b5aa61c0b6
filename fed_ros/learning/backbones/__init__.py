"""Published pretrained vision backbones, defined here and read from local weights files.

``specs`` (no torch) names each backbone's weights file and input rules; ``resnet`` and
``dinov2`` define the architectures with the published state-dict key names; ``files``
finds and strictly loads a weights file; ``trunk`` wraps a loaded backbone with its input
preprocessing, frozen (shared, cached) or fine-tuned. Nothing is imported here, so the
policy configuration can read ``specs`` without importing torch.
"""
