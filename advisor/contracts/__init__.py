"""The contracts: the values rules, engines and reports meet at (findings, rules, what detectors return). The
bottom layer: it imports no other part of advisor, so every layer above may import it."""
