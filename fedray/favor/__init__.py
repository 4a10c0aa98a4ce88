"""FAVoR (federated shared/private LoRA with author-style alignment) and its tooling."""
