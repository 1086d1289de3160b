"""The engine's speed: against Hugging Face's own serving paths (`benchmark`, with `peers`,
`probe` for the machine section, `systems`, `rows`, `report`), two engine settings against
each other (`ab`), and two builds of the paged decode kernel (`kernel_ab`)."""
