"""The rule units (installed as the package `advisor.rules`): one module per rule family, each declaring its rules
(code, title, docs, examples) and its detectors as `FAMILY`. advisor.registry reads them; nothing else lists codes.

ORDER is the order the static engine runs these families in (a later family reads the findings of an earlier one);
a module not named here runs after them."""

ORDER = ("attention", "attention_config", "copies_casts")
