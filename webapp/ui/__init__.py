"""The app's page, one module per tab: each builds its part of the page (``build``) and holds the handlers its
events call, which take the ``Context`` (the app's models) first. ``app.py`` lays the tabs out and launches.

- ``picker``: the model picker above the tabs, and fitting every tab's controls to the loaded model;
- ``classify``, ``explore``, ``compare``, ``batch``, ``inspect``: the tabs, in the page's order.
"""
