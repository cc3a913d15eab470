"""``ember run``: an unmodified torch.compile script, compiled by ember.

``Session`` (session.py) routes torch's compile surface to ember for the duration of a script;
``tables.py`` says what each ``torch._dynamo.config`` knob and each ``torch._dynamo`` /
``torch.compiler`` name means under ember; ``functions.py`` implements those names with ember;
``hooks.py`` notices when the script imports ``torch._dynamo`` or ``torch._inductor.config``
(ember never imports them itself). docs/dropin.md is the user's view.
"""
from ember.dropin.session import Session as Session
