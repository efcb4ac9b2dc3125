"""The served models: what a model entry says, and the chat templates shipped with the code."""
