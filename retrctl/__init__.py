"""retrctl: turn a language model into a small, fast text retriever."""

__version__ = "0.1.0"
