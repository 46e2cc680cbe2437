VARIANTS = {
    "lantern": {"description": "Mention a lantern (use the word \"lantern\").", "weight": 1, "check": "py:contains_all",
                "args": {"keywords": ["lantern"]}},
    "title": {"description": "Give the answer a title wrapped in double angular brackets, such as <<A Quiet Morning>>.",
              "weight": 1, "check": "ifeval:detectable_format:title", "args": {}},
    "ps": {"description": "At the end of your answer, add a postscript starting with P.S.", "weight": 1,
           "check": "ifeval:detectable_content:postscript", "args": {"postscript_marker": "P.S."}},
    "end": {"description": "End your answer with the exact sentence \"Is there anything else I can help with?\"", "weight": 1,
            "check": "ifeval:startend:end_checker", "args": {"end_phrase": "Is there anything else I can help with?"}},
}
DEFAULT = """{question}

Here is a draft answer:
{draft}

The draft already meets these requirements:
{met}
It does not meet these yet:
{unmet}

Rewrite the answer so that it meets every requirement, keeping what the draft already does right. Reply with the \
revised answer only."""
REPEAT = '{question}\n\nHere is a draft answer:\n{draft}\n\nIt already meets:\n{met}\nThe draft does not meet these requirements yet:\n{unmet}\n\nWrite the answer again so that it meets them. Make sure the new answer does this: {unmet}\nReply with the new answer only.'
DIRECT = "{question}\n{unmet}"
TEMPLATES = {"default": DEFAULT, "repeat": REPEAT, "direct": DIRECT}
SETTINGS = {"batches": 2}  # stopped after batch 0 (27 min on the shared CPU)
