"""Stress tests that travel with a forecast (the L* paper's §9): where L* stops being a portable
progress coordinate. `subject` holds the vocabulary every test shares; each test has its own
module and registers itself with the runner that `lstar stress` calls."""
