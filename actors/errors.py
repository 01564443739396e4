"""The actor side's error for settings: a leaf module, so the settings of every part
(actors/synth/settings.py, actors/synth/job_settings.py, actors/quality/settings.py) can raise it without importing each other."""


class ConfigError(ValueError):
    """Settings that cannot work (alone or together); found before any work starts."""
