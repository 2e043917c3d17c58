"""Errors the analysis raises for inputs it cannot analyse (as opposed to bugs)."""


class AnalysisError(ValueError):
    """The capture cannot be analysed as asked (no kernels, an invalid step regex); the message
    says why and how to fix it. The CLI shows it as a one-line error."""
