"""A browsable view of replay sets and episode traces: a static site, one page per problem.

``python -m deliberation_env.view SET_OR_TRACE --out DIR [--serve]`` (docs/replay.md, "Looking at a set"):

| module        | what it does                                                                              |
|---------------|-------------------------------------------------------------------------------------------|
| ``tree``      | plays every joint action of each problem on ``replay_env``; keeps what each agent wrote   |
|               | and every call's prompt and tokens                                                        |
| ``episodes``  | trace files grouped by policy label and problem; a policy's choices against protocols'    |
| ``markup``    | the page shell, escaping (model text is shown as text, bidi controls written out), the    |
|               | index's controls and its rows as data (``data.js``)                                       |
| ``pages``     | a set's index and problem pages; ``trace_pages``: a trace file's                          |
| ``site``      | builds the folder and serves it on 127.0.0.1                                              |
| ``assets``    | the stylesheet, and the script: filters, sort and grouping kept in the URL, previous/next |
"""

from deliberation_env.view.site import build_set_site, build_trace_site, serving

__all__ = ["build_set_site", "build_trace_site", "serving"]
