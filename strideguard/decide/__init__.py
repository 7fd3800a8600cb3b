"""Stage 3, what strideguard decides for each output, as data the fix carries out.

``subject`` reads what a call was handed once, at its entry: the program, its
dialect, target device, backend, output names and the layouts asked, checked
and resolved into the one record every later stage takes;
``facts`` computes the facts about each user output once (what it views, its
produced and promised layout, what it aliases, why); ``view_conversion``
which view copies become views; ``pushdown`` which returned pieces move into
their producers; ``revisions`` what revises the facts after the graph was
read (Inductor's lowering, a backend's passes, shared memory, the layout
asked); ``user_layouts`` the layouts a user asks, resolved.

May import: program and compiler.
"""
