"""What every tab of the page shares (the tabs themselves are ``webapp.tabs``):

- ``endpoints``: ``Context``, what every handler takes first, and how a handler is put behind the memory gate;
  the ``Prepared`` request its estimate and its computation share, and ``api``, a public function from a
  computation;
- ``declarations``: what a tab declares of its requests (``Tab``, ``Api``, ``Shown``, ``Event``, ``Clear``);
- ``events``: the one place that makes handlers and events of those declarations, and keeps to the page only the
  results that belong to what is on screen (the page's request tickets);
- ``controls``: the page's image and map settings, which several tabs read (and the layout helpers they share);
- ``inputs``: input components changed where Gradio's do not fit (the upload, read once, and checked values);
- ``picker``: the model picker above the tabs, fitting every tab's controls to the loaded model.
"""
