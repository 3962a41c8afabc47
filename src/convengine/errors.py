"""Error types shared by every part of convengine."""


class ConvSetupError(ValueError):
    """A convolution problem that is invalid, or that a forced algorithm cannot serve.

    The message names the offending argument and the expected value.
    """
