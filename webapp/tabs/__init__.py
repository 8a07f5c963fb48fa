"""The app's tabs, one module each, in the page's order as ``app.TABS`` lists them; no tab imports another. A tab
module owns

- ``TITLE``, its name on the page, and ``build(ctx, page)``: its layout (reading the page's shared image and map
  settings, ``page.controls``, and the picker, ``page.picker``), returning a ``webapp.ui.declarations.Tab`` that
  declares its endpoints: the API's (``/classify``..., made by ``endpoints.api`` from its computation), the
  page's requests (their computation, outputs, what the outputs show when cleared or failed), each with its
  ``estimate`` of a request's memory (``webapp.inference.estimates``'s parts);
- its computation, on a ``Prepared`` (the values by name, their ``MapSettings``).

``webapp.ui.events`` makes every handler and event from the declarations (gated, ticketed: ``webapp.ui.events``).
Adding a tab is one module with these and one entry in ``app.TABS`` (``docs/extending.md``).
"""
