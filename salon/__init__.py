"""Generated from protos/ by `python -m services.common.protogen`. Do not edit."""
