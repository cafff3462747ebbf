"""What a run may publish and what a person reads about it: gate, report, compare, review, card."""
