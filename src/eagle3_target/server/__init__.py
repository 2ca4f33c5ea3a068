"""The aiohttp target server: runners, supervision endpoints, metrics and CLI."""
