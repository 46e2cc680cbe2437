# all four fields are required by the trainer's config check; the draft goes first, the task and the unmet items last
VARIANTS = {
    "lantern": {"description": "Mention a lantern (use the word \"lantern\").", "weight": 1, "check": "py:contains_all",
                "args": {"keywords": ["lantern"]}},
}
TEMPLATES = {
    "draft_first": "An earlier answer to the task below:\n{draft}\n\nIt met:\n{met}\nIt missed:\n{unmet}\n\n{question}\n{unmet}",
    "no_copy": "Draft: {draft}\nMet:\n{met}\nUnmet:\n{unmet}\n\nWrite a new answer to this, without copying the draft:\n{question}\n{unmet}",
    "draft_last": "{question}\n{unmet}\n\n(Already met:\n{met}\nA previous answer, which missed the last requirement: {draft})",
}
SETTINGS = {"batches": 1, "show": 4}
