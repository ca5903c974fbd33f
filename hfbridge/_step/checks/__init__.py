"""The checks: every value a step is given, checked once, with errors that name what was wrong.

Options (`option_checks`, `value_checks`; `row_checks` for one value per row), the caller's logits and ids
(`caller_inputs`), rows left with nothing to choose (`row_errors`) and errors labelled with `generate`'s step
(`step_errors`).

>>> from hfbridge._step.checks.option_checks import check_flag
>>> check_flag("fast", True, optional=False)
"""
