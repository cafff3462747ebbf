"""Raw text to a shard set: corpus sources, the tokenizer, the TFRecord format, the shard writer,
the shard set's manifest and fingerprint, and the tf.data input that training reads.
"""
