"""The tests' plainest reference: the model's own causal forward over the whole sequence, no cache."""
import torch


def last_logits(model, tokens):
    """The next-token logits after `tokens`, from one full causal forward."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([list(tokens)], device=model.device)).logits[0, -1]


def full_forward_greedy(model, prompt, steps, eos=()):
    """Greedy decoding with one full forward per token: `steps` new ids, or up to and including an eos."""
    seq = list(prompt)
    for _ in range(steps):
        seq.append(int(last_logits(model, seq).argmax()))
        if seq[-1] in eos:
            break
    return seq[len(prompt):]
