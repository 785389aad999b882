"""Generated from protos/ by `python -m salon.common.protogen`. Do not edit."""
