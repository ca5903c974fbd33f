"""`python -m hfbridge.lm_eval ...`: lm-eval's command line, with the model `hfbridge` registered.

Every argument is lm-eval's (`lm_eval --help`); for example
`python -m hfbridge.lm_eval --model hfbridge --model_args model=my_pkg.my_module:build,tokenizer=PATH
--tasks hellaswag`.
"""

from lm_eval.__main__ import cli_evaluate

import hfbridge.lm_eval  # noqa: F401  (registers "hfbridge")

if __name__ == "__main__":
    cli_evaluate()
