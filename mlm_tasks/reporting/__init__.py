"""What a run may publish and what a person reads about it: the gate's rules (`gate`), the run report
(`report`, with `plots`), every run in one table (`compare`), the release review a person approves
(`review`) and the model card published with the model (`card`)."""
