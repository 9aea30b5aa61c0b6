"""Losses of FedDRMan local training (methods.md Eq. 4-8) and the GMM action distribution.

Shapes: B batch, T window, K mixture modes, A action dim, N = B*T, d feature width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class GMMParams:
    """Mixture of diagonal Gaussians per time step: means/scales (B,T,K,A), logits (B,T,K)."""

    means: torch.Tensor
    scales: torch.Tensor
    logits: torch.Tensor

    def float(self) -> "GMMParams":
        """The same distribution in float32 (log-probs are computed outside autocast)."""
        return GMMParams(self.means.float(), self.scales.float(), self.logits.float())


_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def gmm_log_prob(params: GMMParams, actions: torch.Tensor) -> torch.Tensor:
    """log pi(a): actions (B,T,A) -> (B,T)."""
    x = actions.unsqueeze(-2)  # B,T,1,A
    z = (x - params.means) / params.scales
    comp = (-0.5 * z * z - torch.log(params.scales) - _LOG_SQRT_2PI).sum(-1)  # B,T,K
    return torch.logsumexp(F.log_softmax(params.logits, dim=-1) + comp, dim=-1)


def gmm_sample(params: GMMParams, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw a ~ pi (no gradient): (B,T,A)."""
    with torch.no_grad():
        probs = F.softmax(params.logits, dim=-1)
        flat = probs.reshape(-1, probs.shape[-1])
        idx = torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])  # B,T
        gather = idx[..., None, None].expand(*idx.shape, 1, params.means.shape[-1])
        mean = params.means.gather(-2, gather).squeeze(-2)
        scale = params.scales.gather(-2, gather).squeeze(-2)
        noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        return mean + scale * noise


def gmm_mode(params: GMMParams) -> torch.Tensor:
    """Mean of the most probable mixture component (deterministic action): (B,T,A)."""
    idx = params.logits.argmax(-1)
    gather = idx[..., None, None].expand(*idx.shape, 1, params.means.shape[-1])
    return params.means.gather(-2, gather).squeeze(-2)


def bc_nll(
    params: GMMParams, actions: torch.Tensor, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """L_BC (Eq. 4): mean negative log-likelihood over valid (B,T) steps."""
    nll = -gmm_log_prob(params, actions)
    if valid is None:
        return nll.mean()
    w = valid.to(nll.dtype)
    return (nll * w).sum() / w.sum().clamp_min(1.0)


# ---------------------------------------------------------------------------------------
# Subspace distillation (Eq. 5-6)


class _TopProjector(torch.autograd.Function):
    """P = U_r U_r^T from the top-r eigenvectors of symmetric PSD Gram matrices G (..., d, d).

    The backward pass is the derivative of the spectral projector itself,
    dP = sum_{i<=r<j} (u_i^T dG u_j) / (l_i - l_j) (u_i u_j^T + u_j u_i^T),
    which only divides by gaps between the kept and the discarded eigenvalues. Autograd
    through ``eigh`` would divide by every eigenvalue gap, including the (irrelevant)
    near-degenerate pairs inside either block, and produce inf/NaN there.
    """

    @staticmethod
    def forward(ctx, gram: torch.Tensor, rank: int) -> torch.Tensor:  # type: ignore[override]
        evals, evecs = torch.linalg.eigh(gram.double())
        top = evecs[..., -rank:]
        ctx.save_for_backward(evals, evecs)
        ctx.rank = rank
        return (top @ top.mT).to(gram.dtype)

    @staticmethod
    def backward(ctx, grad_p: torch.Tensor):  # type: ignore[override]
        evals, evecs = ctx.saved_tensors
        rank = ctx.rank
        d = evals.shape[-1]
        g = grad_p.double()
        a = evecs.mT @ (g + g.mT) @ evecs
        lam_top = evals[..., d - rank :]
        lam_rest = evals[..., : d - rank]
        eps = 1e-9 * evals.abs().amax(-1, keepdim=True).clamp_min(1e-30)[..., None]
        gap = (lam_top[..., :, None] - lam_rest[..., None, :]).clamp_min(eps)
        k = torch.zeros_like(a)
        k[..., d - rank :, : d - rank] = a[..., d - rank :, : d - rank] / gap
        grad_g = evecs @ k @ evecs.mT
        grad_g = 0.5 * (grad_g + grad_g.mT)
        return grad_g.to(grad_p.dtype), None


def subspace_projector(
    feats: torch.Tensor, rank: int, noise: torch.Tensor | None = None, differentiable: bool = True
) -> torch.Tensor:
    """Rank-r orthogonal projector(s) onto the dominant column space of F = feats^T (Eq. 5).

    ``feats`` is (N, d) or batched (M, N, d) (rows are the N = B*T feature vectors); the
    rank is capped at min(d, N). ``noise`` (same shape), if given, is added before the
    decomposition only (the loss uses the clean features). Instead of an SVD of the d x N
    matrix the smaller Gram matrix is eigen-decomposed: F F^T (d x d), or F^T F (N x N)
    when N < d without gradient (the differentiable path always uses the d x d Gram and
    the gap-only projector derivative). Returns (d, d) or (M, d, d).
    """
    n, d = feats.shape[-2:]
    r = min(int(rank), d, n)
    if r < 1:
        raise ValueError(f"rank must be >= 1, got {rank}")
    if r == d:
        # A full-rank projector is the identity (the noise makes F full rank): no eigh.
        eye = torch.eye(d, device=feats.device, dtype=torch.float32)
        return eye.expand(*feats.shape[:-2], d, d)
    x = feats.float()
    if noise is not None:
        x = x + noise
    if differentiable and torch.is_grad_enabled() and x.requires_grad:
        return _TopProjector.apply(x.mT @ x, r)
    with torch.no_grad():
        xd = x.double()  # a float32 Gram's rounding can exceed its smallest kept eigenvalues
        if n < d:
            # Column space of F from the N x N Gram: U_r = F V_r / sigma_r. Dividing by
            # sigma_r is only accurate while the kept eigenvalues are well above rounding;
            # low-rank features (e.g. joint features of a slow arm: rank 3 in a 32-d space,
            # lifted only by the 0.01 noise) fall back to the d x d Gram, which never divides.
            evals, evecs = torch.linalg.eigh(xd @ xd.mT)
            kept = evals[..., -r:]
            if bool((kept[..., 0] > 1e-9 * kept[..., -1].clamp_min(1e-300)).all()):
                u = (xd.mT @ evecs[..., -r:]) / kept[..., None, :].sqrt()
                return (u @ u.mT).float()
        evals, evecs = torch.linalg.eigh(xd.mT @ xd)
        top = evecs[..., -r:]
        return (top @ top.mT).float()


def subspace_losses(
    teacher: torch.Tensor,
    student: torch.Tensor,
    rank: int = 48,
    noise_std: float = 0.01,
    generator: torch.Generator | None = None,
    reduction: str = "sum",
    grad_through_projector: bool = True,
) -> torch.Tensor:
    """L_sub (Eq. 6) for M modalities at once: features (M, N, d) -> losses (M,).

    L = ||P^g F^g - P^k F^k||_F^2 + ||P^g F^k - P^k F^g||_F^2. ``reduction="sum"`` is the
    paper's Frobenius norm; ``"mean"`` divides by N. Gradients flow into the student
    features and, with ``grad_through_projector``, through the student projector P^k too
    (the paper propagates gradients through everything the student computes). The same
    pre-SVD noise draw perturbs both matrices: it only stabilises the decomposition, and
    a shared draw keeps L_sub exactly 0 while the student equals the teacher. Batching the
    modalities turns 2M small eigendecompositions into two batched calls.
    """
    if reduction not in ("sum", "mean"):
        raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
    if teacher.shape != student.shape or teacher.ndim != 3:
        raise ValueError(
            f"teacher/student features must both be (M, N, d); shapes differ: "
            f"{tuple(teacher.shape)} vs {tuple(student.shape)}"
        )
    fg = teacher.detach().float()
    fk = student.float()
    noise = None
    if noise_std > 0:
        noise = noise_std * torch.randn(
            fg.shape, generator=generator, device=fg.device, dtype=fg.dtype
        )
    pg = subspace_projector(fg, rank, noise, differentiable=False)
    pk = subspace_projector(
        fk if grad_through_projector else fk.detach(),
        rank,
        noise,
        differentiable=grad_through_projector,
    )
    # Row form: (P F)^T = F^T P because P is symmetric.
    term1 = fg @ pg - fk @ pk
    term2 = fk @ pg - fg @ pk
    loss = term1.pow(2).sum((-2, -1)) + term2.pow(2).sum((-2, -1))
    if reduction == "mean":
        loss = loss / fk.shape[-2]
    return loss


def subspace_loss(
    teacher: torch.Tensor,
    student: torch.Tensor,
    rank: int = 48,
    noise_std: float = 0.01,
    generator: torch.Generator | None = None,
    reduction: str = "sum",
    grad_through_projector: bool = True,
) -> torch.Tensor:
    """L_sub^m (Eq. 6) for one modality; features (..., d) are flattened to (N, d)."""
    if teacher.shape != student.shape:
        raise ValueError(
            f"teacher/student feature shapes differ: {tuple(teacher.shape)} "
            f"vs {tuple(student.shape)}"
        )
    d = teacher.shape[-1]
    return subspace_losses(
        teacher.reshape(1, -1, d),
        student.reshape(1, -1, d),
        rank,
        noise_std,
        generator,
        reduction,
        grad_through_projector,
    )[0]


# ---------------------------------------------------------------------------------------
# Action distillation (Eq. 7) and FedProx


def action_distillation_loss(
    teacher: GMMParams,
    student: GMMParams,
    generator: torch.Generator | None = None,
    clamp: float = 50.0,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """L_act = E_{a~pi_T}[log pi_T(a) - log pi_S(a)] with both log-probs clamped to +-clamp."""
    teacher = GMMParams(teacher.means.detach(), teacher.scales.detach(), teacher.logits.detach())
    a_hat = gmm_sample(teacher, generator)
    lp_t = gmm_log_prob(teacher, a_hat).clamp(-clamp, clamp)
    lp_s = gmm_log_prob(student, a_hat).clamp(-clamp, clamp)
    diff = lp_t - lp_s
    if valid is None:
        return diff.mean()
    w = valid.to(diff.dtype)
    return (diff * w).sum() / w.sum().clamp_min(1.0)


def proximal_term(params: list[tuple[torch.Tensor, torch.Tensor]], mu: float) -> torch.Tensor:
    """FedProx: mu/2 * sum ||w - w_global||^2 over (trainable, global) pairs."""
    total = torch.zeros((), device=params[0][0].device) if params else torch.zeros(())
    for w, w0 in params:
        total = total + (w - w0.detach()).pow(2).sum()
    return 0.5 * mu * total
