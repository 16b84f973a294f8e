"""The D3 Explorer page: everything that exists only for the Gradio app (the engine is d3/, the figures viz/)."""
