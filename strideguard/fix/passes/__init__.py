"""Graph transforms, one per module, each doing one job that another module decided.

``insert_output_copies`` reads the facts ``strideguard.decide.facts`` computed for
each output; ``view_copies_to_views`` carries out ``strideguard.decide.view_conversion``'s view
conversions; ``push_pieces_into_producers`` carries out ``strideguard.decide.pushdown``'s
plan; ``detach_copy_to_alias_copy`` retargets the ``detach_copy`` nodes the plan lists.
"""
