"""Studies that run many engines or replays: sweeps (runs), comparisons (bench), the planner, fidelity, the paper's
protocol (paper, reproduce) and the held-out prompts. Every caller of the Engine outside ``run/`` lives here."""
