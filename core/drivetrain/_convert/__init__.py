"""Moving trained weights between frameworks: declared layout rules (layout.py), the engine (engine.py), reading
any framework's model file (source.py), loading and converting (load.py)."""
