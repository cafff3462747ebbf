"""What a person reads about a run: the report's plots (`plots`), every run in one table (`compare`), the
release review a person approves (`review`) and the model card published with the model (`card`)."""
