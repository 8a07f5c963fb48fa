"""The app's tabs, one module each, in the page's order as ``app.TABS`` lists them. A tab module owns

- ``TITLE``, its name on the page, and ``build(ctx, page)``: its components and events (compute ones in the
  ``admission.COMPUTE`` group), returning what other tabs may share (``page.tab(module)``) or a
  ``picker.Fitted`` whose controls follow the loaded model;
- its handlers: the API's (``/classify``..., events of their own that raise their errors) and the page's
  (``show``..., through ``webapp.ui.fresh``: errors in place, stale answers dropped), each taking the
  ``Context`` first;
- its computation, and its ``estimate`` of a request's memory (``webapp.estimates``'s parts), which it hands to
  the memory gate with its handlers (``Context.handler``, ``Context.held``).

Adding a tab is one module with these and one entry in ``app.TABS``.
"""
