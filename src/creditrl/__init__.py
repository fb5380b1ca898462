"""creditrl: RL fine-tuning of language models where credit assignment comes first."""

__version__ = "0.1.0"
