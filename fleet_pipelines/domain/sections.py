"""The sections a proposal is asked for (prompts) and scored on (scoring)."""

PROPOSAL_SECTIONS = (
    "Requirements analysis",
    "Solution approach",
    "Implementation details",
    "Challenges and mitigations",
)
