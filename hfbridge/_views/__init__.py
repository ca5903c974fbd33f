"""Views for notebooks: what one step did, what a whole generation did, and streamers.

Entry points: `explain_step` (`explain_step`, `StepTrace`), `explain_generation` (`explain_generation`,
`GenerationTrace`), `compare` (`compare_step`, `compare_generation`: settings side by side on the same draws).
Below them the renderers: `step_html`, `step_plot`, `trace_view`, `trace_html`
(text, HTML and plots); below those the records they read: `step_record` (`Stage`, `StepRecord`) and
`generation_record` (`TokenStep`, `GenerationRecord`),
`comparison_record` (read by `compare_html`); `html` (the one place text becomes HTML),
`streamers` (`NotebookStreamer`).
Imports: `hfbridge._step`, `hfbridge._generate`.

>>> import torch
>>> from hfbridge._views.explain_step import explain_step
>>> explain_step(torch.tensor([0.0, 1.0]), temperature=0.5).token
1
"""
