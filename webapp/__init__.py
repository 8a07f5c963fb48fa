"""The app's server side: model choice and loading (``models``); ``app.py`` is the UI around it."""
