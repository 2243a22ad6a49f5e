"""Summarizers behind one small protocol (`base.Summarizer`), chosen per session by name."""
