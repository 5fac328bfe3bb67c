from .model import build_classifier

__all__ = ["build_classifier"]
