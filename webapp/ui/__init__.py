"""What every tab of the page shares (the tabs themselves are ``webapp.tabs``):

- ``context``: ``Context``, what every handler takes first, and how a handler is put behind the memory gate;
- ``controls``: the page's image and map settings, which several tabs read (and the layout helpers they share);
- ``endpoints``: what a tab declares of its requests (``Tab``, ``Api``, ``Answer``, ``Event``, ``Clear``), the
  ``Request`` its computations get, and ``api``, a public function from a computation;
- ``wiring``: the one place that makes handlers and events of those declarations;
- ``fresh``: results that belong to what is on screen (the page's request tickets);
- ``inputs``: input components changed where Gradio's do not fit (the upload, read once, and checked values);
- ``picker``: the model picker above the tabs, fitting every tab's controls to the loaded model.
"""
