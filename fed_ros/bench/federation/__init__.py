"""`fed-ros bench federation`: the seed papers' claims on MuJoCo arms, in process (no ROS).

The command is `command`; the experiments it runs are listed once in `experiments`.
"""
